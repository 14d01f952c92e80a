"""Tandem's control plane: the Django project and its main app.

The Celery app is imported here so that `@shared_task` binds to it whenever Django starts (Celery's Django recipe).
"""
from .celery import app as celery_app

__all__ = ("celery_app",)
