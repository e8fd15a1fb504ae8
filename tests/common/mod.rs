//! Helpers shared by the integration tests. Each test binary (`tests/<area>/main.rs`) declares
//! this module and uses only some of it.
#![allow(dead_code)]

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A fresh directory under the system's temp dir, removed when dropped, so test runs leave
/// nothing behind.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `typed-amp-test-<pid>-<name>`, emptied first: a leftover from an earlier run with the
    /// same pid would make a test lie.
    pub fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("typed-amp-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    /// Writes `bytes` to the file `name` in this directory.
    pub fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).expect("write test file");
    }
}

impl Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

use typed_amp::device::{HostKernel, Kernels};
use typed_amp::optim::{OptimizerState, StateRef};
use typed_amp::params::{ParamVisitor, Parameters};
use typed_amp::prelude::{Cpu, Shape, Tensor};
use typed_amp::{precision::AmpElem, precision::DType, tape::MixedGradients};

/// Every parameter and buffer of a model, by path: its precision and the little-endian bytes of
/// its values in that precision.
pub fn param_bytes<M: Parameters<Cpu>>(model: &M) -> Vec<(String, DType, Vec<u8>)> {
    struct Collect(Vec<(String, DType, Vec<u8>)>);
    impl ParamVisitor<Cpu> for Collect {
        type Error = std::convert::Infallible;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            path: &str,
            param: &Tensor<S, E, Cpu>,
            _trainable: bool,
        ) -> Result<(), Self::Error>
        where
            Cpu: Kernels<E>,
        {
            let bytes = param
                .as_vec()
                .into_iter()
                .flat_map(AmpElem::to_le_bytes)
                .collect();
            let dtype = typed_amp::precision::dtype_of::<E>();
            self.0.push((path.to_string(), dtype, bytes));
            Ok(())
        }
    }
    let mut collect = Collect(Vec::new());
    let Ok(()) = model.visit_params(&mut collect);
    collect.0
}

/// An optimizer's whole state over `master`: each store's bytes per trainable parameter
/// (`None` before its first update), and its scalars.
pub type OptimizerBytes = (Vec<(String, Option<Vec<u8>>)>, Vec<(&'static str, i64)>);

pub fn optimizer_bytes<O: OptimizerState<Cpu>, M: Parameters<Cpu>>(
    opt: &O,
    master: &M,
) -> OptimizerBytes {
    struct Collect<'s> {
        stores: Vec<(&'static str, StateRef<'s>)>,
        out: Vec<(String, Option<Vec<u8>>)>,
    }
    impl ParamVisitor<Cpu> for Collect<'_> {
        type Error = std::convert::Infallible;
        fn visit<S: Shape, E: AmpElem>(
            &mut self,
            path: &str,
            param: &Tensor<S, E, Cpu>,
            trainable: bool,
        ) -> Result<(), Self::Error>
        where
            Cpu: Kernels<E>,
        {
            if !trainable {
                return Ok(());
            }
            for (name, store) in &self.stores {
                let store = store
                    .get::<E, Cpu>()
                    .expect("optimizer state in the parameter's precision");
                let bytes = store.get_ref_checked(param).map(|buf| {
                    HostKernel::<E>::try_read(param.device(), buf)
                        .unwrap()
                        .into_iter()
                        .flat_map(AmpElem::to_le_bytes)
                        .collect()
                });
                self.out.push((format!("{name}.{path}"), bytes));
            }
            Ok(())
        }
    }
    let mut collect = Collect {
        stores: opt.stores(),
        out: Vec::new(),
    };
    let Ok(()) = master.visit_params(&mut collect);
    (collect.out, opt.scalars())
}

/// Puts `value` into the first element of one parameter's gradient (scaled or raw: pass
/// `grads.grads_mut()`), allocating it if backward did not.
pub fn inject<E: AmpElem>(
    grads: &mut MixedGradients<Cpu>,
    param: &Tensor<impl Shape, E, Cpu>,
    value: f32,
) where
    Cpu: Kernels<E>,
{
    let buf = grads.store_mut::<E>().get_or_alloc_mut(param).unwrap();
    let dev = param.device();
    let mut values = HostKernel::<E>::try_read(dev, buf).unwrap();
    values[0] = <E as AmpElem>::from_f32(value);
    HostKernel::<E>::try_write(dev, buf, &values).unwrap();
}

/// A checkpoint's tensors, as (name, dtype, shape, bytes).
pub type RawTensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;
/// A checkpoint's metadata.
pub type RawMetadata = std::collections::HashMap<String, String>;

/// Rewrites a checkpoint file: `edit` gets its tensors and metadata.
pub fn rewrite(path: &std::path::Path, edit: impl FnOnce(&mut RawTensors, &mut RawMetadata)) {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap_or_default();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors, &mut meta);
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    std::fs::write(
        path,
        safetensors::tensor::serialize(views, &Some(meta)).unwrap(),
    )
    .unwrap();
}

/// The first CamelCase word of `text` (`HeaderTooLarge`: a lower-case letter followed by an
/// upper-case one), as a `Debug`-printed enum variant shows up in a message meant for people.
pub fn camel_case_word(text: &str) -> Option<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .find(|word| {
            word.as_bytes()
                .windows(2)
                .any(|pair| pair[0].is_ascii_lowercase() && pair[1].is_ascii_uppercase())
        })
}
