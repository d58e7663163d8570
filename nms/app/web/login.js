// The login form: the token is posted once as JSON; the answer sets the session cookie.
const form = document.getElementById("login");
const error = document.getElementById("error");

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.textContent = "";
  const input = document.getElementById("token");
  let response;
  try {
    response = await fetch("/ui/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token: input.value }),
      credentials: "same-origin",
    });
  } catch (e) {
    error.textContent = `the service did not answer: ${e}`;
    return;
  }
  input.value = "";
  if (response.ok) {
    window.location.assign("/ui/");
    return;
  }
  let detail = `${response.status}`;
  try {
    detail = (await response.json()).detail ?? detail;
  } catch (e) { /* not JSON: keep the status */ }
  error.textContent = `refused: ${detail}`;
});
