//! How a token file's documents are laid into a model's windows ([`Packing`]), and the
//! best-fit-decreasing placement that packs them without splitting one.

use std::collections::BTreeSet;

/// How [`TokenDataset`](crate::TokenDataset) makes windows of a token file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// The tokens one after another, cut every `seq` tokens whatever the documents
    /// (pre-training's convention): a window may hold the end of one document and the start
    /// of the next, which attends to it.
    Concat,
    /// Whole documents placed into windows by best-fit decreasing, 1024 documents at a time
    /// in file order, none split (one longer than a window is cut to it); the rest of a
    /// window is padding, neither attended to nor counted. Each document attends to itself
    /// only and its positions restart at 0.
    Documents,
    /// One document per window, the rest padding (what packing saves is measured against).
    Padded,
}

impl Packing {
    /// The name `--packing` takes.
    pub fn name(self) -> &'static str {
        match self {
            Packing::Concat => "concat",
            Packing::Documents => "documents",
            Packing::Padded => "padded",
        }
    }
}

/// Items of the given `sizes` (each at most `capacity`) in bins of `capacity`, by best-fit
/// decreasing: the largest first, each into the fullest bin it fits, or a new one. Returns
/// each bin's items (indices into `sizes`); equal sizes go in index order, so the same sizes
/// give the same bins.
pub fn best_fit_decreasing(sizes: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    // (room left, bin): the bin of least room that still takes a size is the first at or
    // after (size, 0).
    let mut room: BTreeSet<(usize, usize)> = BTreeSet::new();
    for i in order {
        let size = sizes[i];
        assert!(size <= capacity, "an item of {size} in bins of {capacity}");
        match room.range((size, 0)..).next().copied() {
            Some((left, bin)) => {
                room.remove(&(left, bin));
                bins[bin].push(i);
                if left > size {
                    room.insert((left - size, bin));
                }
            }
            None => {
                bins.push(vec![i]);
                if capacity > size {
                    room.insert((capacity - size, bins.len() - 1));
                }
            }
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_decreasing_places_every_item_once_within_capacity() {
        let sizes = [5, 3, 8, 2, 2, 7, 1, 4, 6, 10];
        let bins = best_fit_decreasing(&sizes, 10);
        let mut seen: Vec<usize> = bins.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..sizes.len()).collect::<Vec<_>>());
        for bin in &bins {
            assert!(
                bin.iter().map(|&i| sizes[i]).sum::<usize>() <= 10,
                "{bin:?}"
            );
        }
        // 48 in bins of 10: five bins is the least, and best fit finds it here.
        assert_eq!(bins.len(), 5, "{bins:?}");
        // Largest first: the 10 alone, then 8 with a 2, 7 with 3, ...
        assert_eq!(bins[0], [9]);
        assert_eq!(bins[1], [2, 3]);
    }
}
