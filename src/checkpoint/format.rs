//! The file format: its tag, and the table between typed-amp's precisions and safetensors'
//! dtypes (generated from the one list of precisions).

use safetensors::Dtype as StDtype;

use crate::precision::DType;

/// The format tag written in every checkpoint.
pub const FORMAT: &str = "typed-amp-checkpoint/1";

macro_rules! st_dtypes {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// The safetensors dtype a precision is stored as.
        pub(super) fn st_dtype(dtype: DType) -> StDtype {
            match dtype {
                $(DType::$variant => StDtype::$st,)*
            }
        }

        /// The precision a safetensors dtype holds, if typed-amp trains in it.
        pub(super) fn dtype_of_st(dtype: StDtype) -> Option<DType> {
            match dtype {
                $(StDtype::$st => Some(DType::$variant),)*
                _ => None,
            }
        }
    };
}

crate::with_precisions!(st_dtypes);

/// A safetensors dtype as a sentence names it (`f32`, `bf16`, `i64`).
pub(super) fn st_dtype_name(dtype: StDtype) -> String {
    format!("{dtype:?}").to_lowercase()
}
