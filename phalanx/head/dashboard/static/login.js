// A login link (`/ui/login#token=…`, as `make demo` and `phalanx up` print): the token is
// in the URL's fragment, which the browser never sends to the server (so no access log or
// proxy sees it). Take it out of the address bar and history at once, then sign in with it
// through the ordinary form (a POST, checked like a typed token).
(function () {
  var hash = window.location.hash;
  if (hash.indexOf("#token=") !== 0) {
    return;
  }
  var token = decodeURIComponent(hash.slice("#token=".length));
  history.replaceState(null, "", window.location.pathname + window.location.search);
  var field = document.getElementById("token");
  if (!token || !field || document.getElementById("login-error")) {
    return;
  }
  field.value = token;
  field.form.submit();
})();
