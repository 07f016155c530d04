"""`headlens explore`: a live local page where one types a text and watches every head of a model.

`Explorer(loaded, frame)` computes what the page shows through headlens's library (session.py);
`create_app(explorer, lang)` is the Starlette app serving it (app.py); `serve(...)` runs it under uvicorn.
"""

from headlens.reports.explore.app import create_app
from headlens.reports.explore.session import MAX_TOKENS, Explorer

__all__ = ["MAX_TOKENS", "Explorer", "create_app"]
