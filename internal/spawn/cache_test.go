package spawn

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestTheExecutableCacheEvictsTheLeastRecentlyUsedWithinItsBound(t *testing.T) {
	memfd := func(content string) *os.File {
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "test")
		f.WriteString(content)
		t.Cleanup(func() { f.Close() })
		return f
	}
	c := newExeCache(10)
	c.put("a", memfd("aaaaaa"), 6, []byte("aa"))
	c.put("b", memfd("bbbb"), 4, []byte("bb"))
	if f, head, ok := c.get("a"); !ok || string(head) != "aa" {
		t.Fatal("a is not cached")
	} else {
		f.Close()
	}
	c.put("c", memfd("cccc"), 4, nil) // 6+4+4 > 10: b, the least recently used, goes
	if _, _, ok := c.get("b"); ok {
		t.Fatal("b was not evicted")
	}
	for _, d := range []string{"a", "c"} {
		f, _, ok := c.get(d)
		if !ok {
			t.Fatalf("%s was evicted", d)
		}
		f.Close()
	}
	c.put("huge", memfd("x"), 11, nil)
	if _, _, ok := c.get("huge"); ok || c.len() != 2 {
		t.Fatalf("an executable over the bound was cached (%d entries)", c.len())
	}
	var off *exeCache = newExeCache(0)
	off.put("a", memfd("a"), 1, nil)
	if _, _, ok := off.get("a"); ok {
		t.Fatal("a cache of 0 bytes cached something")
	}
}
