//! The model summary rank 0 logs once training has taken its first step: the trainable
//! parameters (and how many are frozen), and model-state bytes per rank beside the ZeRO
//! formula.

use super::RankContext;
use std::fmt::Write;
use wick_core::{RankStrategy, Sharding};

/// The formula's terms as text, e.g. `4Ψ + 12Ψ/W`.
fn formula_text(s: Sharding) -> String {
    let (mut full, mut sharded) = (0, 0);
    for (is_sharded, bytes) in [(s.params, 4), (s.grads, 4), (s.optimizer, 8)] {
        if is_sharded {
            sharded += bytes;
        } else {
            full += bytes;
        }
    }
    match (full, sharded) {
        (f, 0) => format!("{f}Ψ"),
        (0, s) => format!("{s}Ψ/W"),
        (f, s) => format!("{f}Ψ + {s}Ψ/W"),
    }
}

/// The summary table of `strategy` on `world_size` ranks.
pub(crate) fn model_summary(strategy: &dyn RankStrategy, world_size: usize) -> String {
    let shapes = strategy.parameter_shapes();
    let name_width = shapes
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "   | {:name_width$} | {:>14} | {:>10}",
        "Name", "Shape", "Params"
    );
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{i:>2} | {name:name_width$} | {:>14} | {:>10}",
            format!("{:?}", shape.dims()),
            shape.elem_count()
        );
    }
    let total = strategy.num_parameters();
    let frozen = strategy.num_frozen_parameters();
    let bytes = strategy.state_bytes();
    let sharding = strategy.sharding();
    let frozen_text = match frozen {
        0 => String::new(),
        n => format!(" trainable, {n} frozen (no gradient, no optimizer state)"),
    };
    let _ = writeln!(
        out,
        "total params: {total}{frozen_text}; strategy {} on {world_size} rank(s)",
        strategy.name()
    );
    let _ = writeln!(
        out,
        "model state per rank: params {} B, grads {} B, optimizer {} B, total {} B; AdamW formula {} = {} B (plus padding)",
        bytes.params,
        bytes.grads,
        bytes.optimizer,
        bytes.total(),
        formula_text(sharding),
        sharding
            .adamw_formula_with_frozen(total, frozen, world_size)
            .total()
    );
    out
}

/// The model summary of `ctx`'s strategy, on rank 0 if asked for: logged at info level
/// under the target [`SUMMARY_TARGET`](crate::SUMMARY_TARGET), with the bars suspended
/// meanwhile.
pub(crate) fn log_model_summary<M>(ctx: &RankContext<'_, M>) {
    if ctx.env.rank != 0 || !ctx.config.model_summary {
        return;
    }
    let summary = model_summary(&*ctx.strategy, ctx.env.world_size);
    let log = || log::info!(target: crate::SUMMARY_TARGET, "{summary}");
    match &ctx.bars {
        Some(p) => p.suspend(log),
        None => log(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_read_like_the_design_table() {
        let f = |params, grads, optimizer| {
            formula_text(Sharding {
                params,
                grads,
                optimizer,
            })
        };
        assert_eq!(f(false, false, false), "16Ψ");
        assert_eq!(f(false, false, true), "8Ψ + 8Ψ/W");
        assert_eq!(f(false, true, true), "4Ψ + 12Ψ/W");
        assert_eq!(f(true, true, true), "16Ψ/W");
    }
}
