//! Host memory sized by inputs or attributes: scratch, output and staging buffers. Rust's
//! infallible allocations abort the whole process when memory runs out, which no
//! `catch_unwind` can stop; such buffers are allocated through these helpers instead, so a
//! node that needs more memory than the process can get fails with an error naming the
//! buffer.

use crate::error::{Error, Result};
use std::sync::Mutex;

fn out_of_memory<T>(what: &str, elems: usize) -> Error {
    let mb = elems.saturating_mul(size_of::<T>()) as f64 / 1e6;
    Error::Runtime(format!(
        "out of memory: {what} needs {mb:.1} MB of host memory that could not be allocated"
    ))
}

/// Makes room for `additional` more elements in `v`, or fails naming `what`.
pub fn reserve<T>(v: &mut Vec<T>, additional: usize, what: &str) -> Result<()> {
    v.try_reserve(additional)
        .map_err(|_| out_of_memory::<T>(what, v.len().saturating_add(additional)))
}

/// `len` copies of `value`, or an error naming `what`.
pub fn filled<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory::<T>(what, len))?;
    v.resize(len, value);
    Ok(v)
}

/// An empty vector with room for `n` elements, or an error naming `what`.
pub fn with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory::<T>(what, n))?;
    Ok(v)
}

/// The items of `iter`, collected without aborting: room for the iterator's lower size
/// bound is reserved up front, anything beyond it grows as [`push`] does.
pub fn collect<T>(iter: impl IntoIterator<Item = T>, what: &str) -> Result<Vec<T>> {
    let iter = iter.into_iter();
    let mut v = with_capacity(iter.size_hint().0, what)?;
    for x in iter {
        push(&mut v, x, what)?;
    }
    Ok(v)
}

/// Appends `x` to `v`, growing it (amortised, as `push` does) without aborting.
#[inline]
pub fn push<T>(v: &mut Vec<T>, x: T, what: &str) -> Result<()> {
    if v.len() == v.capacity() {
        reserve(v, v.len().max(16), what)?;
    }
    v.push(x);
    Ok(())
}

/// The first error of a set of parallel tasks that return nothing else.
#[derive(Default)]
pub struct FirstError(Mutex<Option<Error>>);

impl FirstError {
    /// Keeps `r`'s error if it is the first.
    pub fn record(&self, r: Result<()>) {
        if let Err(e) = r {
            let mut first = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            first.get_or_insert(e);
        }
    }

    pub fn into_result(self) -> Result<()> {
        match self.0.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let e = filled(usize::MAX / 4, 0u64, "the test's table").unwrap_err();
        assert!(e.to_string().contains("out of memory: the test's table needs"), "{e}");
        let mut v = vec![1u8];
        assert!(reserve(&mut v, usize::MAX, "more").is_err());
        assert_eq!(filled(3, 7u8, "small").unwrap(), [7, 7, 7]);
        let mut w = Vec::new();
        for i in 0..100 {
            push(&mut w, i, "w").unwrap();
        }
        assert_eq!(w, (0..100).collect::<Vec<_>>());
        assert!(with_capacity::<u64>(usize::MAX / 4, "huge").is_err());
        assert_eq!(collect((0..5).filter(|x| x % 2 == 0), "evens").unwrap(), [0, 2, 4]);
    }

    #[test]
    fn the_first_error_is_kept() {
        let errors = FirstError::default();
        errors.record(Ok(()));
        assert_eq!(FirstError::default().into_result(), Ok(()));
        errors.record(Err(Error::Runtime("first".into())));
        errors.record(Err(Error::Runtime("second".into())));
        assert_eq!(errors.into_result(), Err(Error::Runtime("first".into())));
    }
}
