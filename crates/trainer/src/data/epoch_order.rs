//! `EpochOrder`: the order an epoch visits its samples in, computed an index at a time.
//!
//! A shuffled order is a pseudo-random permutation of `0..len` (a four-round Feistel
//! network on the smallest even number of bits that covers `len`, walking each index's
//! cycle until it lands below `len`), not a list: it takes under 64 bytes whatever the corpus,
//! where a list would take 8 bytes a sample (537 MB for a 17 GB token corpus in windows of
//! 128). Each index costs four hashes per step of its walk, and the domain is at most four
//! times `len`, so a walk takes fewer than four steps on average.

/// The order of one epoch's samples: `at(i)` is the i-th sample visited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochOrder {
    len: usize,
    shuffle: Option<Feistel>,
}

/// A permutation of `0..1 << (2 * half_bits)` keyed by four round keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Feistel {
    half_bits: u32,
    keys: [u64; 4],
}

impl EpochOrder {
    /// The name of the shuffle, which checkpoints record.
    pub const SHUFFLE: &'static str = "feistel4-splitmix64";

    /// `0..len` as it is.
    pub fn in_order(len: usize) -> Self {
        EpochOrder { len, shuffle: None }
    }

    /// A permutation of `0..len` drawn from `seed`: the same seed gives the same order on
    /// every machine and at every world size.
    pub fn shuffled(len: usize, seed: u64) -> Self {
        // Two halves of at least one bit each, together covering len - 1.
        let bits = (usize::BITS - len.saturating_sub(1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut key = wick_core::splitmix64(seed);
        let keys = std::array::from_fn(|_| {
            key = wick_core::splitmix64(key);
            key
        });
        EpochOrder {
            len,
            shuffle: Some(Feistel { half_bits, keys }),
        }
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the epoch has no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `i`-th sample of the epoch.
    ///
    /// # Panics
    /// When `i` is not below [`EpochOrder::len`].
    pub fn at(&self, i: usize) -> usize {
        assert!(
            i < self.len,
            "index {i} of an epoch of {} samples",
            self.len
        );
        let Some(feistel) = self.shuffle else {
            return i;
        };
        // The permutation's cycle through i returns to i, which is below len, so the walk
        // ends; every index of 0..len is reached from exactly one i.
        let mut x = i as u64;
        loop {
            x = feistel.permute(x);
            if x < self.len as u64 {
                return x as usize;
            }
        }
    }

    /// The samples visited at positions `range`, in order.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        range.map(|i| self.at(i)).collect()
    }
}

impl Feistel {
    fn permute(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let mixed = left ^ (wick_core::splitmix64(right ^ key) & mask);
            (left, right) = (right, mixed);
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shuffle_is_a_permutation_of_every_length() {
        for len in (0..70).chain([1000, 1023, 1024, 1025, 65_537]) {
            let order = EpochOrder::shuffled(len, 3);
            let mut seen = order.slice(0..len);
            seen.sort_unstable();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}");
        }
    }

    #[test]
    fn a_shuffle_depends_on_its_seed_and_mixes() {
        let len = 10_000;
        let a = EpochOrder::shuffled(len, 1).slice(0..len);
        assert_eq!(a, EpochOrder::shuffled(len, 1).slice(0..len));
        let b = EpochOrder::shuffled(len, 2).slice(0..len);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // Two independent permutations agree on about one place.
        assert!(same < 10, "{same} places agree");
        // Neighbours land far apart: the mean jump is near len / 3, as for a random order.
        let jump: f64 = a
            .windows(2)
            .map(|w| w[0].abs_diff(w[1]) as f64)
            .sum::<f64>()
            / (len - 1) as f64;
        assert!(
            (jump / len as f64 - 1.0 / 3.0).abs() < 0.02,
            "mean jump {jump}"
        );
        // No place keeps many fixed points.
        let fixed = a.iter().enumerate().filter(|(i, &x)| *i == x).count();
        assert!(fixed < 10, "{fixed} fixed points");
    }

    #[test]
    fn a_large_order_takes_no_memory_of_its_length() {
        let len = 1usize << 40;
        let order = EpochOrder::shuffled(len, 9);
        assert!(std::mem::size_of_val(&order) <= 64);
        assert!((0..1000).all(|i| order.at(len - 1 - i) < len));
    }
}
