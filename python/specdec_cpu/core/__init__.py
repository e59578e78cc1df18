"""The decoding core: one exact step, whatever drives it.

- :mod:`.protocols` — what the core drives: ``SequenceLM`` (many sequences
  in one cache), ``CausalLM`` (one), ``Tokenizer``;
- :mod:`.one_sequence` — ``OneSequenceLM``: a ``CausalLM`` as a ``SequenceLM``
  of one slot (how a single conversation, or a synthetic test model, runs
  through the same core);
- :mod:`.sequence` — ``Sequence``: one generation's tokens, settings, random
  streams, text and statistics;
- :mod:`.step` — ``StepCore``: draft, one target pass, the exact verify,
  roll-back and emit, for every sequence of a step (its glossary defines
  α, γ, accepted, residual, bonus, catch-up, mask and forced);
- :mod:`.penalties` — ``Penalties``: presence, frequency and repeat
  penalties, biases and ``min_tokens`` as sparse row changes, for every
  prefix of a draft;
- :mod:`.logprobs` — ``TokenLogprob`` and the log-probabilities read off
  the verified rows;
- :mod:`.infill` — fill-in-the-middle prompts from a model's FIM tokens;
- :mod:`.stats` — ``Generation`` and ``GenerationStats``;
- :mod:`.text` — token bytes into text, with stop strings;
- :mod:`.request_args` — checks of one request's arguments.

Nothing here chooses γ (that is ``planning/``) or loads a model (``engine/``).
"""
