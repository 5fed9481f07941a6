"""Speculative decoding with the checkpoint's MTP layer; the engine drives `speculator.Speculator`."""
