"""Text in and out: tokenizer loading and chat templates, incremental detokenization with stop
strings, and the lone-surrogate check."""
