"""Tandem's C kernels and their thin wrappers: the float linears of decode steps (matvec), the int8 linears
(int8_linear over int8_matvec.c), decode and prefill attention, and a decode step's layers in one call. build.py
builds them at install and loads them; each wrapper says why torch's path runs where its kernel cannot."""
