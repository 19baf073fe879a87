//! The redis backend (being written).

use std::sync::Arc;

use super::{Backend, StoreOptions};
use crate::error::StoreError;

/// Connect to redis and return the backend.
pub async fn connect(_url: &str, _opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Err(StoreError::Config(
        "the redis backend is not built yet".into(),
    ))
}
