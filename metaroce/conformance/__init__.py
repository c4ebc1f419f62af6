"""The MetaRoCE conformance suite: a tester that plays the remote RC peer of a device under
test with crafted packets (metaroce.wire on a raw socket), a catalogue of tests grouped by spec
clause, adapters for our reference daemon and for any endpoint described by a file, reports
(JUnit, Markdown, clause coverage) and a self-test against deliberately broken builds of the
reference data path."""
