//! The sqlite backend (being written).

use std::sync::Arc;

use super::{Backend, StoreOptions};
use crate::error::StoreError;

/// Connect to sqlite and return the backend.
pub async fn connect(_url: &str, _opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Err(StoreError::Config(
        "the sqlite backend is not built yet".into(),
    ))
}
