"""An HTTP translation service: FastAPI routes over a dynamic batcher, and a page that shows attention.

Needs the optional dependencies: ``pip install 'attnmt[serve]'`` (FastAPI, uvicorn, prometheus-client).
"""
