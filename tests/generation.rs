//! Generation over the KV cache against `transformers`' greedy `generate` on every family
//! fixture (tests/fixtures/hf/generate.json and generate.safetensors, made by
//! scripts/generation_fixtures.py): the logits of each step and the tokens, and the cache's
//! logits against the whole forward's.

use crate::models::{fixtures, max_diff, on_one_cpu, FAMILIES};
use candle_core::{Device, Tensor};
use wick::core::OptimizerConfig;
use wick::models::{generate, CausalLm, Sampling};

/// What transformers generated: the prompt, and each family's end tokens, greedy tokens and
/// the logits of each step (`[new tokens, vocab]`).
struct Generated {
    prompt: Vec<u32>,
    families: serde_json::Value,
    logits: std::collections::HashMap<String, Tensor>,
}

/// A JSON list of token ids.
fn ids(v: &serde_json::Value) -> Vec<u32> {
    let list = v.as_array().unwrap().iter();
    list.map(|i| i.as_u64().unwrap() as u32).collect()
}

fn generated() -> Generated {
    let json = std::fs::read_to_string(fixtures().join("generate.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    Generated {
        prompt: ids(&json["prompt"]),
        families: json["families"].clone(),
        logits: candle_core::safetensors::load(
            fixtures().join("generate.safetensors"),
            &Device::Cpu,
        )
        .unwrap(),
    }
}

fn model(family: &str) -> (CausalLm, Box<dyn wick::core::RankStrategy>) {
    let mut lm = CausalLm::from_pretrained(fixtures().join(family))
        .unwrap()
        .with_optimizer(OptimizerConfig::adamw(1e-3));
    let strategy = on_one_cpu(&mut lm);
    (lm, strategy)
}

/// Greedy generation equals transformers' token for token, and each step's logits (the
/// prompt once, then one cached position at a time, past the sliding windows of 8) are
/// transformers' within 1e-5.
#[test]
fn greedy_generation_equals_transformers_token_for_token_with_its_logits() {
    let g = generated();
    for family in FAMILIES {
        let (lm, _strategy) = model(family);
        let want = &g.families[family];
        let greedy = ids(&want["greedy"]);
        let stop = want["eos_token_id"]
            .as_u64()
            .map(|e| vec![e as u32])
            .unwrap_or_default();
        let sampling = Sampling {
            max_new_tokens: greedy.len(),
            stop,
            ..Sampling::default()
        };
        let tokens = generate(&lm, &g.prompt, &sampling, |_| Ok(())).unwrap();
        assert_eq!(
            tokens, greedy,
            "{family}: greedy tokens differ from transformers'"
        );
        // The logits of each step, the cache fed transformers' own tokens.
        let mut cache = lm.new_cache().unwrap();
        let mut input = g.prompt.clone();
        let mut worst = 0f32;
        for (step, want) in g.logits[family]
            .chunk(greedy.len(), 0)
            .unwrap()
            .iter()
            .enumerate()
        {
            let ids = Tensor::new(input.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let logits = lm.next_logits(&ids, &mut cache).unwrap();
            worst = worst.max(max_diff(&logits, want));
            input = vec![greedy[step]];
        }
        println!(
            "{family}: {} tokens equal, logits within {worst:e}",
            greedy.len()
        );
        assert!(worst <= 1e-5, "{family}: step logits differ by {worst}");
    }
}

/// The cache's logits are the whole forward's at every position, fed in uneven pieces.
#[test]
fn cached_logits_equal_the_whole_forwards_in_any_pieces() {
    let g = generated();
    for family in FAMILIES {
        let (lm, _strategy) = model(family);
        let mut ids = g.prompt.clone();
        ids.extend((0..20u32).map(|i| (i * 37 + 11) % 300));
        let whole = lm
            .logits(
                &Tensor::new(ids.as_slice(), &Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap(),
            )
            .unwrap()
            .squeeze(0)
            .unwrap();
        let mut cache = lm.new_cache().unwrap();
        let mut at = 0;
        for piece in [5, 1, 3, 1, 1, 10, 1, 10] {
            let part = Tensor::new(&ids[at..at + piece], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let next = lm.next_logits(&part, &mut cache).unwrap();
            at += piece;
            let diff = max_diff(&next, &whole.narrow(0, at - 1, 1).unwrap());
            assert!(
                diff <= 1e-5,
                "{family}: position {} differs by {diff}",
                at - 1
            );
        }
        assert_eq!((cache.len(), at), (ids.len(), ids.len()));
    }
}

/// Sampling: the same seed gives the same tokens, another seed others; top-k 1 is greedy;
/// an end token ends it and is kept.
#[test]
fn sampling_is_seeded_warped_and_stops_at_an_end_token() {
    let g = generated();
    let (lm, _strategy) = model("llama");
    let sampled = |seed, top_k, stop: Vec<u32>| {
        let sampling = Sampling {
            max_new_tokens: 30,
            temperature: 1.0,
            top_k,
            top_p: 0.9,
            seed,
            stop,
        };
        generate(&lm, &g.prompt, &sampling, |_| Ok(())).unwrap()
    };
    let (a, b, c) = (
        sampled(1, None, vec![]),
        sampled(1, None, vec![]),
        sampled(2, None, vec![]),
    );
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed drew the same 30 tokens");
    let greedy = generate(
        &lm,
        &g.prompt,
        &Sampling {
            max_new_tokens: 30,
            ..Sampling::default()
        },
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(sampled(1, Some(1), vec![]), greedy, "top-k 1 is greedy");
    let stopped = sampled(1, None, vec![a[4]]);
    let first = a.iter().position(|&t| t == a[4]).unwrap();
    assert_eq!(
        stopped,
        a[..=first],
        "an end token ends the generation, kept"
    );
    let mut streamed = Vec::new();
    generate(
        &lm,
        &g.prompt,
        &Sampling {
            max_new_tokens: 5,
            ..Sampling::default()
        },
        |t| {
            streamed.push(t);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(streamed, greedy[..5]);
}
