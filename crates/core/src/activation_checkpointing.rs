//! Which wrapped units recompute their forward in backward instead of keeping their
//! activations (torchtitan's `activation_checkpoint.mode`: full, selective per layer, none).

use crate::Error;
use std::fmt;
use std::str::FromStr;

/// Which wrapped units ([`crate::ShardedContext::wrap`]) recompute their forward in
/// backward: activation memory traded for a second forward of those units.
///
/// Units count in the order `configure_sharded_model` wraps them. Parsed from and shown as
/// `none`, `full` or `every:K`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActivationCheckpointing {
    /// Every unit keeps its activations from forward to backward.
    #[default]
    None,
    /// Every unit recomputes its forward in backward.
    Full,
    /// Every K-th unit (the K-th, 2K-th, ... in wrap order) recomputes; `every:1` is
    /// `full`.
    Every(usize),
}

impl ActivationCheckpointing {
    /// Whether unit `unit` (0-based, in wrap order) recomputes its forward in backward.
    pub fn recomputes(self, unit: usize) -> bool {
        match self {
            ActivationCheckpointing::None => false,
            ActivationCheckpointing::Full => true,
            ActivationCheckpointing::Every(k) => (unit + 1).is_multiple_of(k.max(1)),
        }
    }
}

impl FromStr for ActivationCheckpointing {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let refuse = || {
            Error::config(
                "activation checkpointing",
                format!("'{s}' is none of none, full, every:K (K a whole number from 1)"),
            )
        };
        match s {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            _ => match s.strip_prefix("every:").map(str::parse::<usize>) {
                Some(Ok(k)) if k >= 1 => Ok(Self::Every(k)),
                _ => Err(refuse()),
            },
        }
    }
}

impl fmt::Display for ActivationCheckpointing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActivationCheckpointing::None => f.write_str("none"),
            ActivationCheckpointing::Full => f.write_str("full"),
            ActivationCheckpointing::Every(k) => write!(f, "every:{k}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ActivationCheckpointing as Ac;

    #[test]
    fn parses_what_it_shows_and_picks_every_kth_unit() {
        for text in ["none", "full", "every:1", "every:3"] {
            assert_eq!(text.parse::<Ac>().unwrap().to_string(), text);
        }
        for bad in ["", "every:", "every:0", "every:x", "some", "Full"] {
            let e = bad.parse::<Ac>().unwrap_err().to_string();
            assert!(
                e.contains("every:K") && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
        let picked = |ac: Ac| (0..6).filter(|&u| ac.recomputes(u)).collect::<Vec<_>>();
        assert_eq!(picked(Ac::None), Vec::<usize>::new());
        assert_eq!(picked(Ac::Full), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(picked(Ac::Every(1)), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(picked(Ac::Every(2)), vec![1, 3, 5]);
        assert_eq!(picked(Ac::Every(3)), vec![2, 5]);
    }
}
