//! Multi-tensor launches on CUDA (Apex's `multi_tensor_apply`): one kernel over every tensor of
//! a parameter set, reading a device-side table of the tensors (their pointers, lengths and
//! per-tensor values) and of their chunks, instead of one launch per tensor.
//!
//! A table is `tensors × W` words (each tensor's words, its length among them), then one word
//! per chunk of [`CHUNK`] elements, `tensor | chunk << 32`: block `b` takes chunks
//! `b, b + grid, …`. Tables are content-addressed: the host builds the words each step (a few
//! words per parameter) and reuses the device copy whose words are the same, so a warmed-up step
//! uploads nothing and allocates nothing. A parameter set's buffers can alternate between a few
//! pointer sets from step to step (gradient buffers swapped with spares), so a few tables are
//! kept per kernel and device.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaDevice, CudaSlice, DevicePtr, DeviceSlice, LaunchConfig};
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::cuda::BLOCK;

/// Elements per chunk: 64 per thread of a block.
pub(crate) const CHUNK: usize = 64 * BLOCK as usize;

/// At most this many blocks; each loops over its chunks.
const MAX_BLOCKS: usize = 4096;

/// Tables kept per kernel and device (beyond this the least recently used one is rewritten).
const KEEP: usize = 4;

/// The words of a table of `entries` (`W` words each, the tensor's length at `len_word`) and
/// the number of chunks.
pub(crate) fn table_words<const W: usize>(
    entries: &[[u64; W]],
    len_word: usize,
) -> Result<(Vec<u64>, usize), CudaError> {
    let mut words: Vec<u64> = entries.iter().flatten().copied().collect();
    let mut chunks = 0;
    for (t, e) in entries.iter().enumerate() {
        let n = (e[len_word] as usize).div_ceil(CHUNK);
        if t > u32::MAX as usize || n > u32::MAX as usize {
            // More tensors or chunks than a table word holds: a bug in the caller.
            return Err(CudaError::Cpu(CpuError::WrongNumElements));
        }
        words.extend((0..n as u64).map(|c| t as u64 | c << 32));
        chunks += n;
    }
    Ok((words, chunks))
}

/// The launch of a multi-tensor kernel over `chunks` chunks.
pub(crate) fn config(chunks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (chunks.min(MAX_BLOCKS) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

struct Table {
    device: Arc<CudaDevice>,
    kernel: String,
    words: Vec<u64>,
    buf: CudaSlice<u64>,
    used: u64,
}

/// Every device's tables. A table keeps its device alive, as any buffer does.
static TABLES: Mutex<(u64, Vec<Table>)> = Mutex::new((0, Vec::new()));

/// The device address of a table holding `words` for `kernel` on `dev`: a kept one with the same
/// words, else the least recently used one rewritten (once `KEEP` are kept), else a new one
/// (each allocation and upload counted in `Cuda::transfer_counts`).
pub(crate) fn device_table(dev: &Cuda, kernel: &str, words: &[u64]) -> Result<u64, CudaError> {
    let device = dev.cuda_device();
    let mut guard = TABLES.lock().unwrap_or_else(PoisonError::into_inner);
    let (clock, tables) = &mut *guard;
    *clock += 1;
    let mine = |t: &Table| Arc::ptr_eq(&t.device, device) && t.kernel == kernel;
    if let Some(t) = tables.iter_mut().find(|t| mine(t) && t.words == words) {
        t.used = *clock;
        return Ok(*t.buf.device_ptr());
    }
    if tables.iter().filter(|t| mine(t)).count() >= KEEP {
        let oldest = tables
            .iter()
            .enumerate()
            .filter(|(_, t)| mine(t))
            .min_by_key(|(_, t)| t.used)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            let t = &mut tables[i];
            if t.buf.len() >= words.len() && !words.is_empty() {
                // Pointer sets that keep changing cost an upload a step, not an allocation: the
                // copy is queued after the kernels that read the old words, and waits for them.
                let mut view = t.buf.slice_mut(0..words.len());
                dev.write_from_host(words, &mut view)?;
                t.words = words.to_vec();
                t.used = *clock;
                return Ok(*t.buf.device_ptr());
            }
            // Kernels queued earlier may still read it: freeing is not ordered with them.
            device.synchronize()?;
            tables.swap_remove(i);
        }
    }
    dev.record_alloc(std::mem::size_of_val(words));
    let mut buf = device.alloc_zeros::<u64>(words.len().max(1))?;
    if !words.is_empty() {
        let mut view = buf.slice_mut(0..words.len());
        dev.write_from_host(words, &mut view)?;
    }
    let ptr = *buf.device_ptr();
    tables.push(Table {
        device: device.clone(),
        kernel: kernel.to_string(),
        words: words.to_vec(),
        buf,
        used: *clock,
    });
    Ok(ptr)
}
