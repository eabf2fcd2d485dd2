// Campanile console: asks before destructive actions (forms with data-confirm), and
// makes the "Back" link of message pages work without inline script.
document.addEventListener("submit", function (e) {
  var message = e.target.getAttribute("data-confirm");
  if (message && !window.confirm(message)) {
    e.preventDefault();
  }
});
document.addEventListener("click", function (e) {
  var a = e.target.closest ? e.target.closest("a[data-back]") : null;
  if (a) {
    e.preventDefault();
    window.history.back();
  }
});
