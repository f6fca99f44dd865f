pub fn run(_: &SizeArgs) -> anyhow::Result<()> {
    Ok(())
}
#[derive(clap::Args)]
pub struct SizeArgs {}
