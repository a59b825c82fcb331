package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/http"
	"strings"
)

// The web view shows every tenant's sessions, so under auth it answers
// only the operator: a request must carry the operator's web token
// (auth.EnsureWebToken; `engine auth token SPEC` prints it), as
// "Authorization: Bearer <token>" (scripts, the JSON a page may fetch), or
// as the session cookie /ui/login sets once the token was typed into its
// form (a browser). A request without it is answered 401 (with the login
// form), one with a wrong token 403. The static assets (style, script,
// icon) are served to anyone: they hold no data. docs/security.md.

// tokenCookie is the cookie a browser signed in with; its value is
// cookieValue(token), not the token.
const tokenCookie = "turnstone_web"

// cookieValue derives the cookie of a token: the token itself never
// sits in the browser, and rotating it signs every browser out.
func cookieValue(token string) string {
	sum := sha256.Sum256([]byte("turnstone web view session\x00" + token))
	return hex.EncodeToString(sum[:])
}

// guard wraps h: with a token, every path but the login page and the
// static assets needs it; without one (no auth) h answers everything.
func (s *Server) guard(h http.Handler) http.Handler {
	if s.cfg.Token == "" {
		return h
	}
	want := []byte(s.cfg.Token)
	wantCookie := []byte(cookieValue(s.cfg.Token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, Prefix+"static/") || r.URL.Path == "/favicon.ico" {
			h.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == Prefix+"login" {
			s.login(w, r, want, wantCookie)
			return
		}
		given, has := "", false
		if a := r.Header.Get("Authorization"); a != "" {
			given, has = strings.TrimPrefix(a, "Bearer "), true
			if subtle.ConstantTimeCompare([]byte(given), want) == 1 {
				h.ServeHTTP(w, r)
				return
			}
		} else if c, err := r.Cookie(tokenCookie); err == nil {
			has = true
			if subtle.ConstantTimeCompare([]byte(c.Value), wantCookie) == 1 {
				h.ServeHTTP(w, r)
				return
			}
		}
		status, msg := http.StatusUnauthorized, "The web view shows every tenant's sessions: sign in with the operator's web token."
		if has {
			status, msg = http.StatusForbidden, "That token is not the operator's web token (or it was rotated): sign in again."
		}
		s.loginPage(w, r, status, msg)
	})
}

// login serves the sign-in form (GET) and checks a token typed into it
// (POST): the right one sets the session cookie and goes to the fleet.
func (s *Server) login(w http.ResponseWriter, r *http.Request, want, wantCookie []byte) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.loginPage(w, r, http.StatusOK, "")
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
		token := strings.TrimSpace(r.PostFormValue("token"))
		if subtle.ConstantTimeCompare([]byte(token), want) != 1 {
			s.loginPage(w, r, http.StatusForbidden, "That token is not the operator's web token.")
			return
		}
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: string(wantCookie), Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

var loginTemplate = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Turnstone: sign in</title>
<link rel="stylesheet" href="{{.Prefix}}static/app.css"></head>
<body><main class="login"><h1>Turnstone</h1>
{{if .Msg}}<p>{{.Msg}}</p>{{end}}
<form method="post" action="{{.Prefix}}login">
<label>Operator's web token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Sign in</button></form>
<p>The operator prints it with <code>engine auth token SPEC</code> (docs/security.md).</p>
</main></body></html>
`))

// loginPage answers status with the sign-in form and msg, or, to a client
// that asks for JSON, with {"error": msg}.
func (s *Server) loginPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="turnstone"`)
	}
	w.Header().Set("Cache-Control", "no-store")
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = loginTemplate.Execute(w, struct{ Prefix, Msg string }{Prefix, msg})
}
