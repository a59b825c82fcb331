package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
)

// rejectLine is one record of `engine rejects --json`.
type rejectLine struct {
	Seq       uint64              `json:"seq"`
	At        time.Time           `json:"at"`
	Subject   string              `json:"subject"`
	Tenant    string              `json:"tenant"`
	Session   string              `json:"session"`
	Publisher string              `json:"publisher"`
	Code      int                 `json:"err_code"`
	Reason    string              `json:"reason"`
	Headers   map[string][]string `json:"headers,omitempty"`
	Body      string              `json:"body"`
	BodyBytes int                 `json:"body_bytes"`
	BodyCut   bool                `json:"body_cut"`
}

func newRejectsCommand(g *globals) *cobra.Command {
	var (
		tenant    string
		limit     int
		bodyBytes int
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "rejects",
		Short: "List the events the ingest refused (the quarantine): when, subject, publisher, why, the body",
		Long: `List the quarantine (stream AGENT_QUARANTINE): every event a publisher sent
that the engine refused, oldest first, with when it came, the subject it
came on, the publisher's identity (its NATS account and user when known),
the reason and error code it was answered with, and its body, masked (as
stored) and cut to --body-bytes. --json prints a JSON array (docs/cli.md).`,
		Example: cli.Examples(
			"the latest events the ingest refused",
			"engine rejects",
			"tenant acme's, as JSON, with whole bodies",
			"engine rejects --tenant acme --body-bytes 0 --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 || bodyBytes < 0 {
				return errors.New("--limit and --body-bytes must not be negative")
			}
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstreamOf(nc)
			if err != nil {
				return err
			}
			recs, err := ingestserver.Rejects(ctx, js, ingestserver.RejectFilter{Tenant: tenant, Limit: limit})
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				recs, err = nil, nil // no quarantine yet: nothing refused
			}
			if err != nil {
				return err
			}
			lines := make([]rejectLine, 0, len(recs))
			for _, r := range recs {
				body, cut := cutBytes(events.MaskString(r.Body), bodyBytes)
				lines = append(lines, rejectLine{Seq: r.Seq, At: r.At, Subject: r.Subject, Tenant: r.Tenant, Session: r.Session,
					Publisher: r.Publisher, Code: r.Code, Reason: events.MaskString(r.Reason), Headers: r.Headers,
					Body: body, BodyBytes: len(r.Body), BodyCut: cut})
			}
			if asJSON {
				return writeJSON(g.stdout, lines)
			}
			if len(lines) == 0 {
				fmt.Fprintln(g.stdout, "no event refused")
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tAT\tSUBJECT\tPUBLISHER\tCODE\tREASON\tBODY")
			for _, l := range lines {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Seq, tableTime(l.At), printable(l.Subject, 80),
					printable(l.Publisher, 40), l.Code, printable(l.Reason, 100), printable(l.Body, 80))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "list only this tenant's records")
	cmd.Flags().IntVar(&limit, "limit", 100, "the latest N records (0: all)")
	cmd.Flags().IntVar(&bodyBytes, "body-bytes", 1024, "cut each body to this many bytes in --json (0: as stored, at most 64 KiB)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// cutBytes returns s cut to at most n bytes at a character boundary, and
// whether it cut; n 0 does not cut.
func cutBytes(s string, n int) (string, bool) {
	if n == 0 || len(s) <= n {
		return s, false
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], true
}

// printable makes s safe to print on one line of a terminal: control
// characters (escape sequences, newlines, C1 controls, bidi overrides)
// become "?" , and it is cut to max runes with "…".
func printable(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n == max {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError, unicode.IsControl(r), unicode.Is(unicode.Bidi_Control, r), r == '\u2028', r == '\u2029':
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}
