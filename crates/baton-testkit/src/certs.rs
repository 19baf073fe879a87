//! Test certificates made with the `openssl` command: a CA, a server
//! certificate it signed for `localhost` and `127.0.0.1`, and a second CA
//! that signed nothing (trusting only it must fail).

use std::path::Path;
use std::process::Command;

/// Write `ca.pem`, `other-ca.pem`, `server.pem` and `server.key` (0600)
/// into `dir`.
pub fn make(dir: &Path) {
    let d = dir.display();
    let script = format!(
        "set -e; cd {d}
         openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=baton-test-ca \
           -keyout ca.key -out ca.pem 2>/dev/null
         openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=baton-other-ca \
           -keyout other-ca.key -out other-ca.pem 2>/dev/null
         openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
           -keyout server.key -out server.csr 2>/dev/null
         printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > ext.cnf
         openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
           -days 2 -extfile ext.cnf -out server.pem 2>/dev/null
         chmod 600 server.key"
    );
    let ok = Command::new("sh")
        .args(["-c", &script])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "openssl could not make the test certificates");
}
