"""Drop-ins of this package's ops into other projects' models. Each module imports its project only when
used (the `models` extra of pyproject.toml installs them):

    transformers    apply(model): Inkling2 / Inkling2Loop's block attention residual reads -> fused_attnres
"""
