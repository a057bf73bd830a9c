//! `softrdma info`: the devices of running softrdma processes.

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let found = softrdma_verbs::registry::query_all(a.json);
    if a.json {
        for (pid, text) in &found {
            println!("{{\"pid\":{pid},\"device\":{text}}}");
        }
        return Ok(());
    }
    if found.is_empty() {
        println!("no softrdma devices are open");
    }
    for (pid, text) in found {
        println!("process {pid}:");
        for line in text.lines() {
            println!("  {line}");
        }
    }
    Ok(())
}
