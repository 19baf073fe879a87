//! The one rule for names users give things: lock names, queues, task
//! kinds and job names are 1 to [`MAX_NAME_LEN`] bytes of printable text.

use crate::error::InvalidInput;

/// The longest accepted name (lock, queue, kind, job), in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Check a name (lock, queue, kind, job): 1 to 255 bytes, no control
/// characters. `what` names the field in the error.
///
/// ```
/// assert!(baton::names::validate_name("queue", "emails").is_ok());
/// let e = baton::names::validate_name("queue", "").unwrap_err();
/// assert_eq!(e.field, "queue");
/// ```
pub fn validate_name(what: &str, name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() {
        return Err(InvalidInput::new(
            what,
            "is empty; give 1 to 255 bytes of text",
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InvalidInput::new(
            what,
            format!(
                "is {} bytes long; at most {MAX_NAME_LEN} bytes are accepted",
                name.len()
            ),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(InvalidInput::new(
            what,
            format!("contains the control character {c:?}; use printable text"),
        ));
    }
    Ok(())
}
