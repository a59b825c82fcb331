//go:build unix

package embeddedtest

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// TestAPortGivenIsNotClaimedByAnotherProcess: a port FreePort gave in
// this process cannot be claimed by another test process (a child run of
// this binary), while one it never gave can.
func TestAPortGivenIsNotClaimedByAnotherProcess(t *testing.T) {
	if os.Getenv("EMBEDDEDTEST_CLAIM") != "" {
		return // the child: TestClaimInChild does the work
	}
	given := FreePort(t)
	claims := func(p int) bool {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run", "^TestClaimInChild$")
		cmd.Env = append(os.Environ(), "EMBEDDEDTEST_CLAIM="+strconv.Itoa(p))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		switch {
		case bytes.Contains(out, []byte("CLAIMED")):
			return true
		case bytes.Contains(out, []byte("REFUSED")):
			return false
		}
		t.Fatalf("child said neither:\n%s", out)
		return false
	}
	if claims(given) {
		t.Fatalf("port %d, given here, was claimed by another process", given)
	}
	other := given + 1
	if other == given || portPool.given[other] {
		other = given - 1
	}
	if !claims(other) {
		t.Fatalf("port %d, never given here, was refused to another process", other)
	}
}

// TestClaimInChild is the child of the test above: it claims the port
// in EMBEDDEDTEST_CLAIM and says whether it could.
func TestClaimInChild(t *testing.T) {
	p, err := strconv.Atoi(os.Getenv("EMBEDDEDTEST_CLAIM"))
	if err != nil {
		t.Skip("run by TestAPortGivenIsNotClaimedByAnotherProcess")
	}
	if claimPort(p) {
		os.Stdout.WriteString("CLAIMED\n")
	} else {
		os.Stdout.WriteString("REFUSED\n")
	}
}
