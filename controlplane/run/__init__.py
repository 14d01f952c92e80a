"""`make run`: the local stack (web, Celery control worker, beat, node agent) under one foreground supervisor."""
