//! One short head's sizes and options, the limits the kernels take, and its matrices where they
//! lie.

/// What a head's rows are padded to ([`ShortHead::stride`]): the f32 lanes of an AVX2 register,
/// the narrowest vectors the kernels run in (they run in sixteen on AVX-512 where a head's
/// width is whole sixteens).
pub const LANES: usize = 8;

/// The most tokens (keys per query row) a short head may have.
pub const MAX_KEYS: usize = 64;

/// The widest head a short head may have.
pub const MAX_HEAD_DIM: usize = 64;

/// One head's sizes and options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShortHead {
    /// Tokens of the sequence: query rows, and keys per row.
    pub tokens: usize,
    /// Columns of one head's queries, keys and values.
    pub head_dim: usize,
    /// Whether token `i` attends only to tokens `j ≤ i`.
    pub causal: bool,
    /// The scores' scale (`1/√head_dim` for scaled dot-product attention).
    pub scale: f32,
}

impl ShortHead {
    /// Whether these kernels take the head: 1 to [`MAX_KEYS`] tokens, heads 1 to
    /// [`MAX_HEAD_DIM`] wide.
    pub fn fits(&self) -> bool {
        (1..=MAX_KEYS).contains(&self.tokens) && (1..=MAX_HEAD_DIM).contains(&self.head_dim)
    }

    /// Elements between the starts of two rows of a matrix: `head_dim` rounded up to [`LANES`].
    pub fn stride(&self) -> usize {
        self.head_dim.div_ceil(LANES) * LANES
    }

    /// Elements of one `tokens × head_dim` matrix (`tokens × stride`).
    pub fn matrix_len(&self) -> usize {
        self.tokens * self.stride()
    }

    /// Tokens rounded up to `lanes`: the row length of the transposed queries and of the
    /// scores (keys as rows, queries in lanes) for vectors of `lanes`.
    pub(super) fn padded_queries(&self, lanes: usize) -> usize {
        self.tokens.div_ceil(lanes) * lanes
    }

    /// Keys query row `i` sees.
    pub(super) fn visible(&self, i: usize) -> usize {
        if self.causal {
            i + 1
        } else {
            self.tokens
        }
    }

    /// Whether the passes may run on sixteen lanes: the head's rows are whole vectors of sixteen
    /// (the lanes a product reads and writes are the head's own), and the queries padded to
    /// sixteen are no more than padded to eight (the ViT's 17 would pad to 32 instead of 24, and
    /// its backward ran 10% slower on sixteen lanes on a Xeon; on a Zen 5 the head ran 18%
    /// faster forward and 7% backward, but the ViT's step showed no difference over eight
    /// alternated runs, BENCHMARKS.md session 54).
    pub(super) fn sixteen_lanes_fit(&self) -> bool {
        self.head_dim.is_multiple_of(16) && self.padded_queries(16) == self.padded_queries(8)
    }

    /// The first query that sees key `j`.
    pub(super) fn first_visible(&self, j: usize) -> usize {
        if self.causal {
            j
        } else {
            0
        }
    }

    /// Where the first vector of `lanes` queries with a query that sees key `j` starts.
    pub(super) fn first_query_vector(&self, j: usize, lanes: usize) -> usize {
        self.first_visible(j) / lanes * lanes
    }

    /// Keys seen by some query of the vector of `lanes` queries from `at`.
    pub(super) fn keys_seen_by(&self, at: usize, lanes: usize) -> usize {
        if self.causal {
            self.tokens.min(at + lanes)
        } else {
            self.tokens
        }
    }

    /// Panics unless the head fits, every matrix holds its rows (the last one's
    /// [`stride`](Self::stride) elements included) and the log-sum-exps are one per token.
    pub(super) fn check(&self, matrices: &[HeadRows<'_>], lse: usize) {
        assert!(self.fits(), "short-head attention: {self:?} does not fit");
        for m in matrices {
            self.check_rows(m.data.len(), m.ld, 0);
        }
        assert!(
            lse == self.tokens,
            "short-head attention: {} log-sum-exps expected, {lse} given",
            self.tokens
        );
    }

    /// Panics unless three matrices' rows (`ld` apart, from `at` in each) fit in `len`
    /// elements and their columns do not overlap.
    pub(super) fn check_grads(&self, len: usize, ld: usize, at: [usize; 3]) {
        let st = self.stride();
        for (g, &a) in at.iter().enumerate() {
            self.check_rows(len, ld, a);
            // Within a row (when there are several) and apart from the other two.
            let in_row = self.tokens == 1 || a + st <= ld;
            let apart = at
                .iter()
                .enumerate()
                .all(|(o, &b)| o == g || a + st <= b || b + st <= a);
            assert!(
                in_row && apart,
                "short-head attention: gradient columns at {at:?}, {st} wide, overlap (rows {ld} apart)"
            );
        }
    }

    /// Panics unless `tokens` rows of [`stride`](Self::stride) elements, `ld` apart from `at`,
    /// fit in `len` elements.
    fn check_rows(&self, len: usize, ld: usize, at: usize) {
        let end = (self.tokens - 1)
            .checked_mul(ld)
            .and_then(|x| x.checked_add(at + self.stride()));
        assert!(
            end.is_some_and(|end| end <= len),
            "short-head attention: {} rows of {} elements, {ld} apart from {at}, do not fit in {len}",
            self.tokens,
            self.stride()
        );
    }
}

/// One head's `tokens × head_dim` matrix where it lies in a larger row-major one: row `i`
/// starts at `data[i·ld]` (the head's first column), and the [`ShortHead::stride`] elements from
/// there are the row's (those past `head_dim`, read with them, never reach an output's first
/// `head_dim` columns).
#[derive(Clone, Copy, Debug)]
pub struct HeadRows<'a> {
    /// The matrix, from its first row's first element.
    pub data: &'a [f32],
    /// Elements between the starts of two rows.
    pub ld: usize,
}

/// The three gradients of one head's `[q, k, v]` where they are written: row `i` of gradient
/// `g` at `data[i·ld + at[g]]`, [`ShortHead::stride`] elements each (those past `head_dim`
/// unspecified). The three column ranges must not overlap and must fit in `ld`.
#[derive(Debug)]
pub struct HeadGradsMut<'a> {
    /// The rows, from the first row's start.
    pub data: &'a mut [f32],
    /// Elements between the starts of two rows.
    pub ld: usize,
    /// Where each of `dq`, `dk` and `dv` starts in a row.
    pub at: [usize; 3],
}
