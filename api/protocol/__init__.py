"""What several endpoints share of the OpenAI (and vLLM) protocol: pydantic base models, errors
and usage (common.py), chat messages, tools and response_format (messages.py), the sampling fields
of chat and completions (sampling_fields.py, structured_outputs.py), logprobs; and their
translation into generation's terms (format_grammar.py, sampling.py) and back (logprobs_output.py).
Each endpoint's own shapes are in api/<endpoint>/protocol.py."""
