//! Whether a backward may follow the forward running on this thread: PyTorch's
//! `torch.no_grad()`, which the trainer applies around evaluation and prediction.
//!
//! Candle records a graph whenever a variable takes part, so this does not stop that; it
//! tells the strategies not to keep what only a backward would use (a unit's activations
//! under full sharding), so an evaluation holds no more than its live tensors.

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether a backward may follow forwards on this thread (true unless inside [`no_grad`]).
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with [`grad_enabled`] false on this thread, restored afterwards (also when `f`
/// panics).
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_grad_holds_for_its_closure_only_and_nests() {
        assert!(grad_enabled());
        no_grad(|| {
            assert!(!grad_enabled());
            no_grad(|| assert!(!grad_enabled()));
            assert!(!grad_enabled());
        });
        assert!(grad_enabled());
        let caught = std::panic::catch_unwind(|| no_grad(|| panic!("inside")));
        assert!(caught.is_err());
        assert!(grad_enabled(), "restored after a panic");
        std::thread::spawn(|| no_grad(|| ())).join().unwrap();
        assert!(grad_enabled(), "another thread's no_grad is its own");
    }
}
