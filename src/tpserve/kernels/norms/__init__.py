"""RMSNorm, the gated norm and the mHC hyper-connections (stream norm, weights, projection, collapse, expand)."""
