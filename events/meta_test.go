package events

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// replyMsg is a jetstream.Msg with a reply subject, for deliveredMeta.
type replyMsg struct {
	jetstream.Msg
	reply string
}

func (m replyMsg) Reply() string { return m.reply }

func (m replyMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, jetstream.ErrNotJSMessage }

// TestDeliveredMetaReadsBothAckForms: the old and the new form of a
// JetStream reply subject give the stream sequence, store time and
// pending count; anything else goes to Metadata.
func TestDeliveredMetaReadsBothAckForms(t *testing.T) {
	t.Parallel()
	at := time.Unix(0, 1764160000123456789)
	for _, reply := range []string{
		"$JS.ACK.AGENT_EVENTS.c1.1.42.7.1764160000123456789.99",
		"$JS.ACK._.HASH.AGENT_EVENTS.c1.1.42.7.1764160000123456789.99.rnd",
		"$JS.ACK.dom.HASH.AGENT_EVENTS.c1.1.42.7.1764160000123456789.99",
	} {
		seq, stored, pending, err := deliveredMeta(replyMsg{reply: reply})
		if err != nil || seq != 42 || !stored.Equal(at) || pending != 99 {
			t.Errorf("%s: seq %d, stored %v, pending %d, %v", reply, seq, stored, pending, err)
		}
	}
	for _, reply := range []string{"", "_INBOX.x", "$JS.ACK.a.b.c", "$JS.ACK.S.c.1.x.7.1.9", "$JS.ACK.a.b.S.c.1.2"} {
		if _, _, _, err := deliveredMeta(replyMsg{reply: reply}); err == nil {
			t.Errorf("%q: no error", reply)
		}
	}
}
