//! Placement and runners: one process keeps everything together and knows
//! what it runs, so every answer is the default one (the engine stands
//! these in for a backend that offers neither).

use crate::backend::{Partitions, Runners};

use super::MemoryBackend;

impl Partitions for MemoryBackend {}

impl Runners for MemoryBackend {}
