// Readers answers, for policy's TestPathReaders, which of Java's ways of
// comparing text without case take two paths for the same. Run as
// "java Readers.java" (a JDK's single-file launch). Input: lines
// "rule<TAB>path". Output: "row<TAB>index<TAB>reader" for each row a
// reader takes for the same, then "char<TAB>reader<TAB>hex<TAB>ascii" for
// each code point from U+0080 that a reader takes for an ASCII text.
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.regex.Pattern;

public class Readers {
	static final int CI = Pattern.CASE_INSENSITIVE | Pattern.UNICODE_CASE;
	static final String ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789";

	public static void main(String[] args) throws IOException {
		BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
		PrintStream out = new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.out)), false, "UTF-8");
		String line;
		for (int i = 0; (line = in.readLine()) != null; i++) {
			String[] f = line.split("\t", -1);
			String rule = f[0], s = f[1];
			if (rule.equalsIgnoreCase(s)) out.println("row\t" + i + "\tjava String.equalsIgnoreCase");
			if (rule.toLowerCase(Locale.ROOT).equals(s.toLowerCase(Locale.ROOT))) out.println("row\t" + i + "\tjava String.toLowerCase");
			if (rule.toUpperCase(Locale.ROOT).equals(s.toUpperCase(Locale.ROOT))) out.println("row\t" + i + "\tjava String.toUpperCase");
			if (Pattern.compile(Pattern.quote(rule), CI).matcher(s).matches()) out.println("row\t" + i + "\tjava Pattern CASE_INSENSITIVE|UNICODE_CASE");
		}
		Pattern any = Pattern.compile("[a-z0-9]", CI);
		for (int cp = 0x80; cp <= 0x10FFFF; cp++) {
			if (cp >= 0xD800 && cp <= 0xDFFF) continue;
			String c = new String(Character.toChars(cp));
			if (c.length() == 1) {
				for (int k = 0; k < ALNUM.length(); k++) {
					String x = ALNUM.substring(k, k + 1);
					if (c.equalsIgnoreCase(x)) out.println("char\tjava String.equalsIgnoreCase\t" + Integer.toHexString(cp) + "\t" + x);
				}
			}
			if (any.matcher(c).matches()) {
				for (int k = 0; k < ALNUM.length(); k++) {
					String x = ALNUM.substring(k, k + 1);
					if (Pattern.compile(Pattern.quote(x), CI).matcher(c).matches()) out.println("char\tjava Pattern CASE_INSENSITIVE|UNICODE_CASE\t" + Integer.toHexString(cp) + "\t" + x);
				}
			}
			image(out, "java String.toLowerCase", cp, c.toLowerCase(Locale.ROOT));
			image(out, "java String.toUpperCase", cp, c.toUpperCase(Locale.ROOT));
		}
		out.flush();
	}

	// image reports c's image under a case mapping when it is ASCII text.
	static void image(PrintStream out, String reader, int cp, String img) {
		for (int i = 0; i < img.length(); i++) {
			if (img.charAt(i) >= 0x80) return;
		}
		out.println("char\t" + reader + "\t" + Integer.toHexString(cp) + "\t" + img);
	}
}
