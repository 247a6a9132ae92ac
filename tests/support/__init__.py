"""What the tests share: tiny models, a stand-in engine and server clients, references and
compile helpers. Test files stay at the top of tests/; everything here is imported by them."""
