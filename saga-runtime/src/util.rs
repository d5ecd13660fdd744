//! Small helpers every floor may use: a boxed future, the text of a caught
//! panic, locks that survive a panic, and a broadcast as a stream.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What `rx` receives, as a stream that ends when the sender is gone; a
/// receiver that fell behind skips what it missed (the in-process stores'
/// cancellation notices, which a heartbeat also reports).
pub(crate) fn broadcast_stream<T: Clone + Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<T>,
) -> futures::stream::BoxStream<'static, T> {
    use futures::StreamExt;
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(item) => return Some((item, rx)),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

/// The text of a panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Locks that stay usable after a thread panicked while holding them.
///
/// What these locks guard is bookkeeping a panic cannot leave half-written
/// in a way that matters more than stopping the engine would (a cache, a
/// count, a list of watchers): a poisoned lock is taken as it is, rather
/// than turning one panicked step into a panic in every later caller.
pub(crate) trait Unpoisoned<T: ?Sized> {
    /// The guard, poisoned or not.
    type Guard<'a>
    where
        Self: 'a;
    fn locked(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Unpoisoned<T> for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    fn locked(&self) -> Self::Guard<'_> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// [`Unpoisoned`] for a read-write lock: `read` and `write`.
// Only the Redis backend and the metrics recorder hold read-write locks.
#[cfg_attr(not(any(feature = "redis", feature = "metrics")), allow(dead_code))]
pub(crate) trait UnpoisonedRw<T: ?Sized> {
    fn read_locked(&self) -> std::sync::RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> std::sync::RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> UnpoisonedRw<T> for std::sync::RwLock<T> {
    fn read_locked(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn write_locked(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
