package stalwart

import (
	"os"
	"testing"
)

// backend returns the address in env var name, or skips the test with a
// one-line reason. With STALWART_REQUIRE_BACKENDS=1 (CI, `make test`) a missing
// address fails instead, so a live-cluster check cannot silently vanish.
func backend(t *testing.T, name string) string {
	t.Helper()
	address := os.Getenv(name)
	if address != "" {
		return address
	}
	if os.Getenv("STALWART_REQUIRE_BACKENDS") == "1" {
		t.Fatalf("%s is not set and STALWART_REQUIRE_BACKENDS=1", name)
	}
	t.Skipf("%s not set: no live server to test against", name)
	return ""
}
