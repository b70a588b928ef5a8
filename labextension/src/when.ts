/**
 * Times, written one way: the user's local time, 24-hour, with the weekday and date when it is
 * not today, and the time zone's short name where the moment matters (a deadline, a stop).
 */

function zoneName(d: Date): string {
  const part = new Intl.DateTimeFormat([], { timeZoneName: 'short' })
    .formatToParts(d)
    .find(p => p.type === 'timeZoneName');
  return part ? part.value : '';
}

/** "14:05" today, "Thu 3 Dec 14:05" another day; `zone` adds " CET" (the local zone). */
export function localTime(at: number | string | Date, zone = false): string {
  const d = at instanceof Date ? at : new Date(at);
  if (Number.isNaN(d.getTime())) {
    return '–';
  }
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });
  const day =
    d.toDateString() === new Date().toDateString()
      ? ''
      : `${d.toLocaleDateString([], { weekday: 'short', day: 'numeric', month: 'short' })} `;
  return `${day}${time}${zone ? ` ${zoneName(d)}` : ''}`;
}

/** The full local date and time with zone, for tooltips: "Thu 3 Dec 2026, 14:05:09 CET". */
export function localFull(at: number | string | Date): string {
  const d = at instanceof Date ? at : new Date(at);
  if (Number.isNaN(d.getTime())) {
    return '–';
  }
  const date = d.toLocaleDateString([], { weekday: 'short', day: 'numeric', month: 'short', year: 'numeric' });
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  return `${date}, ${time} ${zoneName(d)}`;
}
