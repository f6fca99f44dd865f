//! Serve every file of a directory over HTTP on 127.0.0.1 with range support, for benchmarks
//! and demos: `cdi-serve-files DIR [PORT]`. Prints the base URL, runs until interrupted.

use cdi_testkit::{Behaviour, FileServer};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or_else(|| std::io::Error::other("usage: cdi-serve-files DIR"))?;
    let server = FileServer::start(None).await;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.is_file() {
            let name = path
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .to_string();
            server.add_file(
                &format!("/{name}"),
                &path,
                Behaviour {
                    ranges: true,
                    ..Default::default()
                },
            )?;
        }
    }
    println!("{}", server.url("/"));
    tokio::signal::ctrl_c().await?;
    Ok(())
}
