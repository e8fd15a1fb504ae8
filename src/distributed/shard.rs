//! Each rank's shard of an epoch's example order.

/// Rank `rank`'s shard of `order` among `size` ranks, as PyTorch's `DistributedSampler`: `order`
/// is padded with its own first elements to a multiple of `size`, and rank `r` takes elements
/// `r, r + size, r + 2·size, ...`. Every rank gets the same number of examples, so every rank
/// takes the same number of steps.
pub fn shard<T: Clone>(order: &[T], rank: usize, size: usize) -> Vec<T> {
    assert!(size > 0 && rank < size, "rank {rank} of {size}");
    if order.is_empty() {
        return Vec::new();
    }
    let per_rank = order.len().div_ceil(size);
    (0..per_rank)
        .map(|i| order[(i * size + rank) % order.len()].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_example_and_have_equal_sizes() {
        let order: Vec<usize> = (0..10).collect();
        let shards: Vec<Vec<usize>> = (0..3).map(|r| shard(&order, r, 3)).collect();
        assert!(shards.iter().all(|s| s.len() == 4));
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, order);
        assert_eq!(shard(&order, 0, 1), order);
    }
}
