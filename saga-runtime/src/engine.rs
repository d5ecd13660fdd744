//! Engine (stub while the runtime is written).
use crate::error::Error;
use crate::task::{TaskId, TaskInstance};
use crate::saga::{Saga, Cancellable};

/// The engine.
#[derive(Clone)]
pub struct Engine {}
/// Builder.
pub struct EngineBuilder {}
/// Cancel result.
#[derive(Debug)]
pub enum CancelResult { /// c
 Cancelled }
/// Dead letter.
pub struct DeadLetter {}
impl Engine {
    /// b
    pub fn builder() -> EngineBuilder { EngineBuilder {} }
    /// t
    pub async fn tasks_of(&self, _saga: &str) -> Result<Vec<TaskInstance>, Error> { Ok(vec![]) }
    /// s
    pub async fn start<S: Saga>(&self, _input: S::Input) -> Result<TaskId, Error> { todo!() }
    /// c
    pub async fn cancel<S: Cancellable>(&self, _id: TaskId) -> Result<CancelResult, Error> { todo!() }
}
impl EngineBuilder {
    /// s
    pub fn saga<S: Saga>(self, _s: S) -> Self { self }
    /// b
    pub async fn build(self) -> Result<Engine, Error> { Ok(Engine {}) }
}
