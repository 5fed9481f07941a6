"""KDA (recurrences, short conv, gate), the DSA indexer and sparse MLA."""
