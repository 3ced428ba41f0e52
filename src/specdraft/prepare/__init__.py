"""``specdraft prepare``: conversations -> token sequences identical to what the verifier's server
saw and generated, with a loss mask that is 1 exactly on the generated tokens and the stop token.
"""
