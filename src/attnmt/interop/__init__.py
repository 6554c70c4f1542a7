"""Other toolkits' models in, fast engines out: MarianMT (OPUS-MT) import, CTranslate2 and ONNX
export, and the translators that run the exported models. The optional libraries each needs are
extras of the package (``pip install 'attnmt[hf]'``, ``'attnmt[export]'``); :mod:`.extras` names
the missing one."""
