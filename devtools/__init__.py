"""The project's own tooling, kept out of the wheel: the impl mutant corpus and its harness
(`python -m devtools.mutants`), the mutmut driver and its report (`mutants_tool`,
`MUTATION.md`), the CrossHair gate's broken targets (`broken_contracts`) and the benches' chart
writer (`plot`). Run from a checkout; everything here checks or measures `kvsched`."""
