# The 20.2M-parameter Llama the measuring scripts train (the throughput example's
# `--llama`), pre-trained from its shape on the licenses text: sourced with the repository's
# root in `here` and a `wick` in `wick`, it writes `llama.json` and `tokens.safetensors`
# into the current directory and sets `llama_args`, the `wick fit` options that train it.
cat > llama.json <<'JSON'
{"model_type": "llama", "vocab_size": 8192, "hidden_size": 512,
 "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 4, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
"$wick" prepare --no-progress --tokenizer "$here/tests/fixtures/hf/llama/tokenizer.json" \
  --output tokens.safetensors "$here/data/licenses.txt" > /dev/null
llama_args="--model llama.json --tokenizer $here/tests/fixtures/hf/llama/tokenizer.json --data tokens.safetensors --seq 256 --batch-size 8"
