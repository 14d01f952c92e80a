"""The capacity model, pure: fitted stage curves (curves), from measured points to a stage model (calibration),
the serving simulation (simulation), the replica search (search) and schedule windows (windows).

Nothing here imports Django or any control-plane module outside this package (a test keeps it so): plain values in,
plain values out, each rule testable in one call. Rows, series and writes are the other half's: the capacity
selectors and services.
"""
