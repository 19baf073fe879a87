//! The postgres backend (being written).

use std::sync::Arc;

use super::{Backend, StoreOptions};
use crate::error::StoreError;

/// Connect to postgres and return the backend.
pub async fn connect(_url: &str, _opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Err(StoreError::Config(
        "the postgres backend is not built yet".into(),
    ))
}
