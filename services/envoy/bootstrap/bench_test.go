package bootstrap

import "testing"

// BenchmarkMarshalBootstrap is the encoding alone, on the already built default bootstrap.
func BenchmarkMarshalBootstrap(b *testing.B) {
	c := testConfig(b)
	node, err := buildNode(c)
	if err != nil {
		b.Fatal(err)
	}
	bs, err := defaultBootstrap(c, node)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := marshalBootstrap(bs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWrite is the whole job: read pod files, build, marshal, re-indent, write, rename.
func BenchmarkWrite(b *testing.B) {
	c := testConfig(b)
	for b.Loop() {
		if _, err := Write(c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderDefault is Write without the file system write.
func BenchmarkRenderDefault(b *testing.B) {
	c := testConfig(b)
	for b.Loop() {
		if _, err := renderDefault(c); err != nil {
			b.Fatal(err)
		}
	}
}
