//! wick-models alone: the tiny Llama of wick's test fixtures, read from its Hugging Face
//! directory, its parameters made by a plain `ParamSource` of whole tensors (no strategy,
//! no trainer), then a loss, a backward and ten plain SGD steps by hand.
//!
//! `cargo run -p wick-models --example tiny_llama`
//!
//! `-- DIR --logits OUT` reads another Hugging Face directory instead and, in place of the
//! steps, writes the ids of the text and their logits (`ids`, `logits`) to the safetensors
//! file OUT: `scripts/hf_export_check.py` compares them with `transformers`' on the same
//! directory.

use candle_core::{Device, Tensor, Var};
use std::sync::{Arc, Mutex};
use wick_models::{
    CausalLm, ParamInit, ParamRequest, ParamSource, ShardedContext, SoloWorld, TrainModule,
};

/// Every parameter whole, as a variable: read from the weights, or drawn from its init.
#[derive(Default)]
struct Whole(Mutex<Vec<(String, Var)>>);

impl ParamSource for Whole {
    fn get_or_create(&self, request: ParamRequest<'_>) -> candle_core::Result<Tensor> {
        let (name, shape, dtype, device) =
            (request.name, request.shape, request.dtype, request.device);
        let var = match request.init {
            ParamInit::Weights(w) => {
                let values = w.read(name, shape, 0..shape.elem_count())?;
                Var::from_tensor(&Tensor::from_vec(values, shape, device)?.to_dtype(dtype)?)?
            }
            ParamInit::Init(init) => init.var(shape, dtype, device)?,
        };
        self.0.lock().unwrap().push((name.to_string(), var.clone()));
        Ok(var.as_tensor().clone())
    }

    fn contains(&self, name: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(n, _)| n == name)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/hf/llama");
    let (dir, logits_out) = match args.as_slice() {
        [] => (fixture, None),
        [dir, flag, out] if flag == "--logits" => (dir.as_str(), Some(out)),
        _ => return Err("usage: tiny_llama [DIR --logits OUT.safetensors]".into()),
    };
    let mut model = CausalLm::from_pretrained(dir)?;
    let source = Arc::new(Whole::default());
    let ctx = ShardedContext::new(source.clone(), Arc::new(SoloWorld), Device::Cpu, "example");
    {
        let _open = ctx.enter();
        model.configure_sharded_model(&ctx)?;
    }
    let tokenizer = model
        .tokenizer()
        .expect("the directory has a tokenizer")
        .clone();
    let ids = tokenizer.encode("Permission is hereby granted, free of charge, to any person")?;
    let n = ids.len() - 1;
    let inputs = Tensor::new(&ids[..n], &Device::Cpu)?.unsqueeze(0)?;
    let targets = Tensor::new(&ids[1..], &Device::Cpu)?.unsqueeze(0)?;
    if let Some(out) = logits_out {
        let logits = model.logits(&inputs)?;
        candle_core::safetensors::save(
            &[("ids".to_string(), inputs), ("logits".to_string(), logits)].into(),
            out,
        )?;
        println!("wrote the logits of {n} tokens to {out}");
        return Ok(());
    }
    let params = source.0.lock().unwrap().clone();
    println!(
        "{} parameters in {} tensors",
        model.config().num_parameters(),
        params.len()
    );
    for step in 0..10 {
        let loss = model.loss(&inputs, &targets)?;
        let grads = loss.backward()?;
        for (_, var) in &params {
            if let Some(g) = grads.get(var.as_tensor()) {
                var.set(&(var.as_tensor() - (g * 0.5)?)?)?;
            }
        }
        println!("step {step}: loss {:.4}", loss.to_scalar::<f32>()?);
    }
    Ok(())
}
