# Hydra imports this package to read conf/ (pkg://posenc.conf); importing posenc.config here
# registers the schema (posenc_schema, named in config.yaml's defaults) in Hydra's ConfigStore
# first, whoever composes: the CLI, the compose API, a test.
import posenc.config  # noqa: F401
