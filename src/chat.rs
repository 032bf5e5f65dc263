//! `wick chat`: a conversation with a chat model on the terminal. Each line read is a user
//! message; the conversation so far goes through the model's chat template with the
//! generation prompt, and the answer is written as it is generated, until an end-of-turn
//! token. The end of the input (Ctrl-D) ends the conversation.

use crate::cli::ChatArgs;
use crate::generator::Generator;
use anyhow::Context;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};

/// Runs the conversation of the lines of `input`, writing the answers to `out`.
pub fn run(args: &ChatArgs, input: impl BufRead, out: &mut impl Write) -> anyhow::Result<()> {
    let generator = Generator::open(args.from.source())?.context(
        "wick chat needs a chat model: a checkpoint of a `fit --model` run, or --model DIR",
    )?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({ "role": "system", "content": system }));
    }
    // A prompt sign only where a person types.
    let typed = std::io::stdin().is_terminal();
    let ask = |out: &mut dyn Write| -> std::io::Result<()> {
        if typed {
            write!(out, "> ")?;
            out.flush()?;
        }
        Ok(())
    };
    ask(out)?;
    for line in input.lines() {
        let line = line.context("reading the conversation")?;
        if !line.trim().is_empty() {
            messages.push(json!({ "role": "user", "content": line }));
            let prompt = generator.chat_prompt(&messages)?;
            let answer = generator.stream(&prompt, &args.sampling, out)?;
            writeln!(out)?;
            messages.push(json!({ "role": "assistant", "content": answer }));
        }
        ask(out)?;
    }
    Ok(())
}
