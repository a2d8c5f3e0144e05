//! `uext4 bench` (being written).
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[arg(long)]
    quick: bool,
}

pub fn run(_a: BenchArgs) -> Result<()> {
    anyhow::bail!("bench: not built yet")
}
