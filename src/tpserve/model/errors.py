"""The error a checkpoint's config raises where tpserve cannot serve a value (model/config.py for the model's
fields, model/quant.py for its quantization_config), below both."""


class UnsupportedConfigError(ValueError):
    """A config.json value tpserve cannot serve (the message names the field)."""
