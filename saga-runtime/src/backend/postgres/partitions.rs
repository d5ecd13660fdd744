//! Placement: one database holds everything together (row locks settle
//! races), so nothing is partitioned. (Runner announcements: not yet.)

use super::PostgresBackend;
use crate::backend::Partitions;

impl Partitions for PostgresBackend {}
